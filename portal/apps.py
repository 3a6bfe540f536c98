from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Teams and members"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from rest_framework.authtoken.models import Token

        from portal.tokens import token_forget

        # A revoked token, a deactivated user or a changed staff flag must hold from the next
        # request on, whatever changed it (API, admin, shell): the cached lookup goes with it.
        for model in (Token, get_user_model()):
            post_save.connect(token_forget, sender=model, dispatch_uid=f"token-forget-save-{model.__name__}")
            post_delete.connect(token_forget, sender=model, dispatch_uid=f"token-forget-delete-{model.__name__}")
