from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save
from django.utils.translation import gettext_lazy as _


class InventoryConfig(AppConfig):
    name = "inventory"
    verbose_name = _("Inventory: clusters, nodes, GPUs and pools")

    def ready(self) -> None:
        from inventory.models import HostToken
        from inventory.services import host_token_forget

        # However a token changes (revoked through the API or the admin, deleted with its
        # cluster), the cached lookup of its key goes with it.
        post_save.connect(host_token_forget, sender=HostToken, dispatch_uid="host-token-forget-save")
        post_delete.connect(host_token_forget, sender=HostToken, dispatch_uid="host-token-forget-delete")
