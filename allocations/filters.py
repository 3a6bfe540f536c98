import django_filters

from allocations.models import Quota, Reservation


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
