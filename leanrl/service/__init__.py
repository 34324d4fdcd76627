"""The verification service (``leanrl serve``), its HTTP client, and the warm sandbox pool.

Sandboxed runtimes (``docker``, ``modal``) run the service inside each sandbox and talk to it
with :class:`~leanrl.service.client.ServiceClient`. Submodules are imported on demand so that
``import leanrl.service`` stays cheap (FastAPI is only imported by :mod:`leanrl.service.app`).
"""
