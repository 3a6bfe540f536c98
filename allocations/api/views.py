"""Reservations, pools and quotas over REST. Views parse, call one service or selector, answer."""
from __future__ import annotations

from datetime import timedelta

from django.db.models import Prefetch, prefetch_related_objects
from django.utils import timezone
from django.utils.translation import gettext as _
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from allocations import selectors, services, shapes
from allocations.api.serializers import (
    ApplyJobSerializer,
    AvailabilityQuery,
    PoolSerializer,
    PriorityClassSerializer,
    QuotaSerializer,
    ReservationCreateInput,
    ReservationDetailSerializer,
    ReservationExtendInput,
    ReservationKeepInput,
    ReservationSerializer,
    SlotSerializer,
    TeamUseSerializer,
    reservation_data,
)
from allocations.filters import ApplyJobFilterSet, QuotaFilterSet, ReservationFilterSet
from allocations.models import ApplyJob, PriorityClass, Quota, Reservation, ReservationEvent
from common.api import IsStaffOrReadOnly
from common.errors import NotFound
from inventory.filters import GpuPoolFilterSet
from inventory.models import GpuPool
from teams.selectors import teams_of

EVENTS = Prefetch("events", queryset=ReservationEvent.objects.select_related("actor"))
APPLY_JOBS = Prefetch("apply_jobs", queryset=ApplyJob.objects.select_related("cluster"))


class ReservationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    filterset_class = ReservationFilterSet
    serializer_class = ReservationSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the OpenAPI schema (and `check --deploy`) reads no rows
            return Reservation.objects.none()
        qs = selectors.reservations_visible_to(self.request.user)
        if self.action == "retrieve":
            qs = qs.prefetch_related(EVENTS, APPLY_JOBS)
        return qs

    def list(self, request: Request) -> Response:
        # Rows of exactly the shown columns, not model instances; pagination is always on
        # (REST_FRAMEWORK settings), and the page gets its GPUs in one query.
        reservations = self.filter_queryset(self.get_queryset())
        rows = self.paginator.paginate_rows(reservations.values_list(*selectors.RESERVATION_ROW), self.request,
                                            self, count_of=reservations)
        page = selectors.with_allocated_gpus([selectors.reservation_from_row(row) for row in rows])
        return self.get_paginated_response([reservation_data(reservation) for reservation in page])

    def get_object(self) -> Reservation:
        return selectors.with_queue(selectors.with_allocated_gpus([super().get_object()]), every_state=True)[0]

    def get_serializer_class(self):
        return ReservationDetailSerializer if self.action == "retrieve" else ReservationSerializer

    def _answer(self, reservation: Reservation, code: int = status.HTTP_200_OK, *, detail: bool = False) -> Response:
        # The service already checked who may see it; load only what the answer shows. Create and
        # release answer the reservation and its GPUs (history and jobs cost two more queries and are
        # one GET away); extend also shows the history, where the extension is recorded.
        selectors.with_allocated_gpus([reservation])
        if detail:
            prefetch_related_objects([reservation], EVENTS, APPLY_JOBS)
            return Response(ReservationDetailSerializer(reservation).data, status=code)
        return Response(reservation_data(reservation), status=code)

    @extend_schema(request=ReservationCreateInput, responses={201: ReservationSerializer})
    def create(self, request: Request) -> Response:
        data = ReservationCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        reservation = services.reservation_create(actor=request.user, request=services.ReservationRequest(
            **data.validated_data))
        # The service set its GPUs from the rows it placed them with.
        return Response(reservation_data(reservation), status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=ReservationSerializer, description=(
        "Release a running reservation early, or cancel one that has not started: its GPUs are free again at "
        "once. One whose window has already ended expires instead. 409 `not_live` once it is over."))
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: str) -> Response:
        reservation = services.reservation_release(actor=request.user, reservation_id=self._id(pk))
        return self._answer(reservation)

    @extend_schema(request=ReservationExtendInput, responses=ReservationDetailSerializer, description=(
        "Move `ends_at` later on the same GPUs. Refused with 409 `gpus_busy` (another booking takes one of them "
        "sooner; the answer gives the latest possible end), `gpus_unusable` (one of them is unhealthy or its "
        "node is drained), `quota_exceeded` or `gpu_hours_exceeded`; 400 `after_current_end` or `max_duration`."))
    @action(detail=True, methods=["post"])
    def extend(self, request: Request, pk: str) -> Response:
        data = ReservationExtendInput(data=request.data)
        data.is_valid(raise_exception=True)
        reservation = services.reservation_extend(actor=request.user, reservation_id=self._id(pk),
                                                  ends_at=data.validated_data["ends_at"])
        return self._answer(reservation, detail=True)

    @extend_schema(methods=["POST"], request=ReservationKeepInput, responses=ReservationDetailSerializer,
                   description=(
        "Mark it keep, with a reason (staff see it): the pool's idle reclaim leaves it alone, and a pending idle "
        "release is called off. 409 `keep_allowance` when its team already keeps the pool's allowance of live "
        "reservations there; `not_live` once it is over. DELETE unmarks it."))
    @extend_schema(methods=["DELETE"], request=None, responses={200: ReservationDetailSerializer},
                   description="Unmark it: the pool's idle reclaim may release it again once it sits idle.")
    @action(detail=True, methods=["post", "delete"])
    def keep(self, request: Request, pk: str) -> Response:
        if request.method == "DELETE":
            reservation = services.reservation_keep(actor=request.user, reservation_id=self._id(pk), keep=False)
        else:
            data = ReservationKeepInput(data=request.data)
            data.is_valid(raise_exception=True)
            reservation = services.reservation_keep(actor=request.user, reservation_id=self._id(pk), keep=True,
                                                    reason=data.validated_data["reason"])
        return self._answer(reservation, detail=True)

    def _id(self, pk: str) -> int:
        # The service answers 404 for reservations the caller's teams do not own.
        try:
            reservation_id = int(pk)
        except ValueError:
            reservation_id = 0
        if not 1 <= reservation_id < 2**63:  # beyond a bigint SQLite's driver refuses outright
            raise NotFound(_("Reservation '%(id)s' does not exist.") % {"id": pk}, field="id", rule="does_not_exist")
        return reservation_id


class PoolViewSet(viewsets.ModelViewSet):
    """Pools with their occupancy now. Everyone signed in reads the pools they may use; staff write."""

    serializer_class = PoolSerializer
    filterset_class = GpuPoolFilterSet
    permission_classes = [IsStaffOrReadOnly]
    lookup_field = "slug"
    lookup_value_regex = r"[-a-zA-Z0-9_]+"  # only slugs reach the database (a NUL byte was a 500)

    def get_queryset(self):
        return selectors.with_occupancy(selectors.pools_visible_to(self.request.user))

    @extend_schema(parameters=[AvailabilityQuery], responses=SlotSerializer(many=True), description=(
        "What the pool has free per slot of [start, end) (default: now to a day later, hourly), in the pool's "
        "unit, for the shape in the query: whole GPUs (`gpus`), shares (`shares`), instances of a MIG profile "
        "(`mig_profile`, `count`) or GPUs with `gpu_memory_mib` (or `gpu_memory_pct`) and `gpu_cores_pct` free "
        "(vgpu). With `gpu_models` (repeated, one model each), only GPUs of those models count, as a reservation "
        "with that `gpu_models` would be placed. `fits` says whether that shape could be booked for the slot. A "
        "field of another mode, a profile not in the pool's layout, a model the pool lacks or a value out of range "
        "is a 400 naming the field and the rule."))
    # A timeline, not a list of resources: every slot of the window in one array (the window's slot count
    # is bounded by AvailabilityQuery), so not paged, and the schema says so.
    @action(detail=True, methods=["get"], pagination_class=None)
    def availability(self, request: Request, slug: str) -> Response:
        pool: GpuPool = self.get_object()
        query = AvailabilityQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        start = query.validated_data.get("start") or timezone.now()
        end = query.validated_data.get("end") or start + timedelta(days=1)
        amounts = {name: query.validated_data[name] for name in shapes.AMOUNT_FIELDS if name in query.validated_data}
        slots = selectors.pool_availability(pool, start, end, timedelta(seconds=query.validated_data["slot"]),
                                            shapes.Amounts(**amounts), gpu_models=query.validated_data.get("gpu_models"))
        return Response(SlotSerializer(slots, many=True).data)


class QuotaViewSet(viewsets.ModelViewSet):
    """Members read their teams' quotas; staff read all and write them."""

    serializer_class = QuotaSerializer
    filterset_class = QuotaFilterSet
    permission_classes = [IsStaffOrReadOnly]

    def get_queryset(self):
        qs = Quota.objects.select_related("team", "pool")
        return qs if self.request.user.is_staff else qs.filter(team__in=teams_of(self.request.user))

    def perform_create(self, serializer: QuotaSerializer) -> None:
        serializer.instance = self._set(serializer.validated_data)

    def perform_update(self, serializer: QuotaSerializer) -> None:
        current = serializer.instance
        merged = {"team": current.team, "pool": current.pool, "max_ge": current.max_ge,
                  "ge_hours_per_month": current.ge_hours_per_month, "priority_class": current.priority_class,
                  "max_borrow_ge": current.max_borrow_ge,
                  **serializer.validated_data}
        serializer.instance = self._set(merged)

    def _set(self, data: dict) -> Quota:
        return services.quota_set(actor=self.request.user, team=data["team"], pool=data["pool"],
                                  max_ge=data["max_ge"], ge_hours_per_month=data.get("ge_hours_per_month"),
                                  priority_class=data.get("priority_class"),
                                  max_borrow_ge=data.get("max_borrow_ge"))


class PriorityClassViewSet(viewsets.ModelViewSet):
    """Priority classes: everyone signed in reads them; staff write. A class a quota grants cannot be
    deleted (409 `protected`)."""

    serializer_class = PriorityClassSerializer
    permission_classes = [IsStaffOrReadOnly]
    queryset = PriorityClass.objects.all()
    lookup_field = "name"


class ApplyJobViewSet(viewsets.ReadOnlyModelViewSet):
    """Staff: every apply, undo and reconcile job, newest first (failed reconciles show drift a cluster refused
    to repair). Members see the jobs of their reservations on the reservation itself."""

    serializer_class = ApplyJobSerializer
    filterset_class = ApplyJobFilterSet
    permission_classes = [permissions.IsAdminUser]
    queryset = ApplyJob.objects.select_related("cluster").order_by("-created_at", "-id")


class TeamUsageView(APIView):
    """A team's use in GPU-equivalents: held now and GE-hours this calendar month (UTC), in total and
    per pool, each split by sharing mode and GPU model, beside its quotas and team-wide cap. Members
    and staff read it; for anyone else the team does not exist (404)."""

    @extend_schema(responses=TeamUseSerializer)
    def get(self, request: Request, slug: str) -> Response:
        team = teams_of(request.user).filter(slug=slug).first()
        if team is None:
            raise NotFound(_("Team '%(slug)s' does not exist.") % {"slug": slug}, field="slug", rule="does_not_exist")
        return Response(TeamUseSerializer(selectors.team_use(team)).data)
