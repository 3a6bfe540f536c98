from django.apps import AppConfig
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save
from django.utils.translation import gettext_lazy as _


class TeamsConfig(AppConfig):
    name = "teams"
    verbose_name = _("Teams and members")

    def ready(self) -> None:
        from django.contrib.auth import get_user_model

        from teams.credentials import credentials_changed, credentials_changing
        from teams.models import ApiToken
        from teams.tokens import refuse_saving_a_limited_user, token_forget

        User = get_user_model()
        # A deleted token, a deactivated user or a changed staff flag must hold from the next
        # request on, whatever changed it (API, admin, shell): the cached lookup goes with it.
        for model in (ApiToken, User):
            post_save.connect(token_forget, sender=model, dispatch_uid=f"token-forget-save-{model.__name__}")
            post_delete.connect(token_forget, sender=model, dispatch_uid=f"token-forget-delete-{model.__name__}")
        m2m_changed.connect(token_forget, sender=ApiToken.teams.through, dispatch_uid="token-forget-teams")
        pre_save.connect(refuse_saving_a_limited_user, sender=User, dispatch_uid="refuse-saving-limited-user")
        # A new password or a deactivation ends the user's tokens and sessions.
        pre_save.connect(credentials_changing, sender=User, dispatch_uid="credentials-changing")
        post_save.connect(credentials_changed, sender=User, dispatch_uid="credentials-changed")
