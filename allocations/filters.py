import django_filters

from allocations.models import ApplyJob, Quota, Reservation


class ReservationFilterSet(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__slug")
    pool = django_filters.CharFilter(field_name="pool__slug")
    state = django_filters.MultipleChoiceFilter(choices=Reservation.State.choices)
    starts_after = django_filters.IsoDateTimeFilter(field_name="starts_at", lookup_expr="gte")
    ends_before = django_filters.IsoDateTimeFilter(field_name="ends_at", lookup_expr="lte")

    class Meta:
        model = Reservation
        fields = ["team", "pool", "state"]


class QuotaFilterSet(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__slug")
    pool = django_filters.CharFilter(field_name="pool__slug")

    class Meta:
        model = Quota
        fields = ["team", "pool"]


class ApplyJobFilterSet(django_filters.FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__slug")
    action = django_filters.ChoiceFilter(choices=ApplyJob.Action.choices)
    status = django_filters.MultipleChoiceFilter(choices=ApplyJob.Status.choices)
    reservation = django_filters.NumberFilter(field_name="reservation_id")

    class Meta:
        model = ApplyJob
        fields = ["cluster", "action", "status", "reservation"]
