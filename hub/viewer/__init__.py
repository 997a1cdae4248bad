"""The web audit viewer (docs/viewer.md): the built single-page app under ``/ui/`` and the few
read-only JSON endpoints its pages need. The app itself is a client of ``agora.v1``."""

from hub.viewer.app import PREFIX as VIEWER_PATH
from hub.viewer.app import create_viewer_app
from hub.viewer.build import STATIC_DIR, WEB_DIR, check_build, source_hash

__all__ = [
    "STATIC_DIR",
    "VIEWER_PATH",
    "WEB_DIR",
    "check_build",
    "create_viewer_app",
    "source_hash",
]
