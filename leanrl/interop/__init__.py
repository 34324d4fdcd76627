"""Ways in from other ecosystems (docs/interop.md).

Nothing here is imported by ``import leanrl``: each module imports its ecosystem's package
(``verifiers``) itself, and only it needs the matching extra (``leanrl[verifiers]``).
"""
