"""Launchers: run ``leanrl train es|grpo`` and ``leanrl eval`` here or on Modal.

``launcher.name = "local"`` is the default (everything in this process). ``"modal"`` defines a
Modal app in code (:mod:`leanrl.launch.modal_app`: images per role, a Volume, a Secret, GPU
Functions), and runs the same functions either on Modal or, with ``launcher.modal.backend =
"local"``, in processes on this machine (:mod:`leanrl.launch.local_functions`). Importing this
package is light: Modal and torch load only when a launch starts.
"""

from __future__ import annotations

from leanrl.launch.config import EstimateConfig, LauncherConfig, ModalLaunchConfig

__all__ = ["EstimateConfig", "LauncherConfig", "ModalLaunchConfig"]
