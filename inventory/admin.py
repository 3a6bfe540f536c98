from django import forms
from django.contrib import admin

from common.errors import ApplicationError, ValidationFailed
from inventory import services
from inventory.kubernetes import crypto
from inventory.kubernetes.client import parse_kubeconfig
from inventory.models import Cluster, Gpu, GpuPool, HostToken, Node


class ClusterForm(forms.ModelForm):
    """The kubeconfig is write-only here too: the stored (encrypted) one is never shown."""

    kubeconfig = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 8, "autocomplete": "off"}), required=False, strip=False,
        help_text="Paste a kubeconfig (credentials inline) to replace the stored one; leave empty to keep it.",
    )

    class Meta:
        model = Cluster
        fields = ["name", "slug", "kind", "description", "in_cluster"]

    def clean_kubeconfig(self) -> str:
        text = self.cleaned_data.get("kubeconfig") or ""
        if text.strip():
            try:
                parse_kubeconfig(text)
            except ValidationFailed as exc:
                raise forms.ValidationError(exc.message) from exc
        return text

    def clean(self) -> dict:
        data = super().clean()
        if data.get("kind") != Cluster.Kind.KUBERNETES:
            if (data.get("kubeconfig") or "").strip():
                self.add_error("kubeconfig", "Only Kubernetes clusters take a kubeconfig.")
            if data.get("in_cluster"):
                self.add_error("in_cluster", "Only Kubernetes clusters take in-cluster credentials.")
        return data

    def save(self, commit: bool = True) -> Cluster:
        cluster = super().save(commit=False)
        if self.cleaned_data.get("kubeconfig", "").strip():
            cluster.kubeconfig_encrypted = crypto.encrypt(self.cleaned_data["kubeconfig"])
        if commit:
            cluster.save()
        return cluster


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    form = ClusterForm
    list_display = ["slug", "name", "kind", "has_credentials", "last_discovered_at", "created_at"]
    list_filter = ["kind"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["has_credentials", "last_discovered_at", "discovery_error"]

    @admin.display(boolean=True, description="credentials")
    def has_credentials(self, obj: Cluster) -> bool:
        return obj.has_credentials


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "healthy", "schedulable", "last_seen_at"]
    list_filter = ["cluster", "healthy", "schedulable"]
    search_fields = ["name"]


@admin.register(GpuPool)
class GpuPoolAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "sharing_mode", "placement_policy"]
    list_filter = ["sharing_mode"]
    prepopulated_fields = {"slug": ["name"]}


class GpuForm(forms.ModelForm):
    """A booked GPU keeps its pool and node here as in the API (services.gpu_move_check): the
    refusal shows on the form instead of the move going through under a reservation."""

    class Meta:
        model = Gpu
        fields = "__all__"

    def clean(self):
        cleaned = super().clean()
        if self.instance.pk is not None:
            try:
                services.gpu_move_check(gpu=self.instance, fields={
                    name: cleaned[name] for name in ("pool", "node") if name in cleaned})
            except ApplicationError as refused:
                raise forms.ValidationError(refused.message) from None
        return cleaned


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    form = GpuForm
    list_display = ["uuid", "node", "index", "model_name", "memory_mib", "pool", "healthy"]
    list_filter = ["pool", "model_name", "healthy", "node__cluster"]
    search_fields = ["uuid", "node__name"]
    list_editable = ["pool", "healthy"]
    list_select_related = ["node__cluster", "pool"]

    def get_changelist_form(self, request, **kwargs):
        # The list's inline pool edits go through the same check (Django's default form skips `form`).
        return super().get_changelist_form(request, form=GpuForm, **kwargs)


@admin.register(HostToken)
class HostTokenAdmin(admin.ModelAdmin):
    """Tokens are created through the API (the key is shown once); here staff see and revoke them."""

    list_display = ["cluster", "host_name", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["cluster", ("revoked_at", admin.EmptyFieldListFilter)]
    readonly_fields = ["cluster", "host_name", "prefix", "created_by", "created_at", "last_used_at"]
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset) -> None:
        for token in queryset:
            services.host_token_revoke(actor=request.user, token=token)
