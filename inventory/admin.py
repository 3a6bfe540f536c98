from django import forms
from django.contrib import admin
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce

from common.errors import ApplicationError, ValidationFailed
from inventory import services
from common import crypto
from inventory.kubernetes.client import parse_kubeconfig
from django.utils.html import format_html_join
from django.utils.translation import gettext_lazy as _

from inventory.models import Cluster, Gpu, GpuModel, GpuModelWeightChange, GpuPool, HostToken, Node


class ClusterForm(forms.ModelForm):
    """The kubeconfig is write-only here too: the stored (encrypted) one is never shown."""

    kubeconfig = forms.CharField(
        label=_("Kubeconfig"),
        widget=forms.Textarea(attrs={"rows": 8, "autocomplete": "off"}), required=False, strip=False,
        help_text=_("Paste a kubeconfig (credentials inline) to replace the stored one; leave empty to keep it."),
    )

    prometheus_bearer_token = forms.CharField(
        label=_("Prometheus bearer token"),
        widget=forms.PasswordInput(attrs={"autocomplete": "off"}), required=False, strip=False,
        help_text=_("A bearer token for prometheus_url (or a username and password below); stored encrypted. Leave "
                    "all three empty to keep the stored one."))
    prometheus_username = forms.CharField(label=_("Prometheus username"), required=False,
                                          widget=forms.TextInput(attrs={"autocomplete": "off"}))
    prometheus_password = forms.CharField(label=_("Prometheus password"), required=False, strip=False,
                                          widget=forms.PasswordInput(attrs={"autocomplete": "off"}))
    forget_prometheus_credentials = forms.BooleanField(label=_("Forget the Prometheus credentials"), required=False,
                                                       help_text=_("Remove the stored one"))

    class Meta:
        model = Cluster
        fields = ["name", "slug", "kind", "description", "in_cluster", *services.TELEMETRY_FIELDS]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # A form that leaves the telemetry settings out (or empty) keeps what the cluster has.
        for name in services.TELEMETRY_FIELDS:
            self.fields[name].required = False

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
                self.add_error("kubeconfig", _("Only Kubernetes clusters take a kubeconfig."))
            if data.get("in_cluster"):
                self.add_error("in_cluster", _("Only Kubernetes clusters take in-cluster credentials."))
        # The telemetry settings are checked together by the same rules as the API's.
        for name in services.TELEMETRY_FIELDS:
            if data.get(name) in (None, "") and name not in ("prometheus_url", "exporter_namespace",
                                                             "exporter_via_proxy"):
                data[name] = getattr(self.instance, name)
        auth = {k: data.get(f"prometheus_{k}") or "" for k in ("bearer_token", "username", "password")}
        self.prometheus_auth = {} if data.get("forget_prometheus_credentials") else (
            {k: v for k, v in auth.items() if v} or None)
        probe = Cluster(**{name: data.get(name, getattr(self.instance, name)) for name in services.TELEMETRY_FIELDS},
                        kind=data.get("kind") or self.instance.kind, in_cluster=bool(data.get("in_cluster")),
                        kubeconfig_encrypted=self.instance.kubeconfig_encrypted or (data.get("kubeconfig") or "").strip())
        try:
            services.cluster_telemetry_check(cluster=probe, prometheus_auth=self.prometheus_auth)
        except ValidationFailed as exc:
            named = exc.errors[0].field
            field = "prometheus_bearer_token" if named == "prometheus_auth" else named if named in self.fields else None
            self.add_error(field, exc.message)
        self.prometheus_auth_encrypted = probe.prometheus_auth_encrypted
        return data

    def save(self, commit: bool = True) -> Cluster:
        cluster = super().save(commit=False)
        if self.cleaned_data.get("kubeconfig", "").strip():
            cluster.kubeconfig_encrypted = crypto.encrypt(self.cleaned_data["kubeconfig"])
        if self.prometheus_auth is not None:
            cluster.prometheus_auth_encrypted = self.prometheus_auth_encrypted
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

    @admin.display(boolean=True, description=_("credentials"))
    def has_credentials(self, obj: Cluster) -> bool:
        return obj.has_credentials


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "healthy", "schedulable", "last_seen_at"]
    list_filter = ["cluster", "healthy", "schedulable"]
    search_fields = ["name"]


class GpuPoolAdminForm(forms.ModelForm):
    class Meta:
        model = GpuPool
        fields = "__all__"
        help_texts = {"sharing_config": _(
            "The mode's parameters (JSON). time_slicing and mps: {\"replicas\": 4}. mig: {\"mig_layout\": "
            "\"all-balanced\"} or {\"profiles\": [\"3g.40gb\", \"2g.20gb\"]}; add \"dynamic\": true to carve each "
            "GPU on demand (the layout is then optional: what an idle GPU is set to; hosts need their agent started "
            "with --allow-mig-reconfigure). vgpu: {\"default_memory_mib\": 8192, \"default_cores_pct\": 25}.")}


@admin.register(GpuPool)
class GpuPoolAdmin(admin.ModelAdmin):
    form = GpuPoolAdminForm
    list_display = ["slug", "name", "sharing_mode", "placement_policy", "idle_reclaim"]
    list_filter = ["sharing_mode", "idle_reclaim"]
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

    @admin.action(description=_("Revoke the selected tokens"))
    def revoke(self, request, queryset) -> None:
        for token in queryset:
            services.host_token_revoke(actor=request.user, token=token)


class GpuModelForm(forms.ModelForm):
    """The weight is checked by the service's rule (the same refusal as the API's), shown on the form."""

    class Meta:
        model = GpuModel
        fields = ["name", "weight"]

    def clean_name(self):
        name = self.cleaned_data.get("name")
        if self.instance.pk is None and name and not Gpu.objects.filter(model_name=name).exists():
            raise forms.ValidationError(_("No GPU of this model is in the inventory (the name must match "
                                          "the GPUs' model name exactly)."))
        return name

    def clean_weight(self):
        try:
            return services.gpu_model_weight_check(self.cleaned_data.get("weight"))
        except ApplicationError as refused:
            raise forms.ValidationError(refused.message) from None


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    """Staff weigh GPU models here or through the API; every change goes through
    services.gpu_model_weight_set, which records it (the history below and under "GPU model weight
    changes"). A model without a row weighs 1.0, so rows are not deleted here: set 1.0 instead."""

    form = GpuModelForm
    list_display = ["name", "weight", "gpus", "updated_at"]
    search_fields = ["name"]
    readonly_fields = ["history"]

    def get_queryset(self, request):
        gpus = Gpu.objects.filter(model_name=OuterRef("name")).order_by().values("model_name").annotate(
            n=Count("id")).values("n")
        return super().get_queryset(request).annotate(gpu_count=Coalesce(Subquery(gpus), 0))

    @admin.display(description=_("GPUs"), ordering="gpu_count")
    def gpus(self, obj: GpuModel) -> int:
        return obj.gpu_count

    def get_readonly_fields(self, request, obj=None):
        # The name is the model's identity (Gpu.model_name): fixed once the row exists.
        return ["name", "history"] if obj is not None else ["history"]

    @admin.display(description=_("Weight history (newest first)"))
    def history(self, obj: GpuModel) -> str:
        if obj is None or obj.pk is None:
            return "—"
        changes = GpuModelWeightChange.objects.filter(name=obj.name).select_related("actor")[:50]
        return format_html_join(
            "", "<div>{} · {} · {} → {}</div>",
            ((f"{c.at:%Y-%m-%d %H:%M}", c.actor.username if c.actor else "—", c.old_weight, c.new_weight)
             for c in changes)) or _("No changes recorded.")

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj: GpuModel, form, change: bool) -> None:
        saved = services.gpu_model_weight_set(actor=request.user, name=obj.name, weight=obj.weight)
        obj.pk, obj.updated_at = saved.pk, saved.updated_at


@admin.register(GpuModelWeightChange)
class GpuModelWeightChangeAdmin(admin.ModelAdmin):
    """The record of weight changes: read-only (made by services.gpu_model_weight_set)."""

    list_display = ["name", "old_weight", "new_weight", "actor", "at"]
    list_filter = ["name"]
    search_fields = ["name"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
