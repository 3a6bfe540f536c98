from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class WiringConfig(AppConfig):
    """Installed for its management command (runembedded) and its deploy checks; it has no models."""

    name = "config"
    verbose_name = _("Project wiring")

    def ready(self) -> None:
        from config import checks  # noqa: F401  (registers the deploy checks)
