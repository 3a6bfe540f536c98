from django.apps import AppConfig


class WiringConfig(AppConfig):
    """Installed for its management command (runembedded) and its deploy checks; it has no models."""

    name = "config"
    verbose_name = "Project wiring"

    def ready(self) -> None:
        from config import checks  # noqa: F401  (registers the deploy checks)
