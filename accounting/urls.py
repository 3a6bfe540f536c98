from django.urls import path

from accounting import views

app_name = "accounting"

urlpatterns = [
    path("teams/<slug:slug>/statements/<str:month>/", views.statement, name="statement"),
    path("reports/", views.reports_page, name="reports"),
    path("reports/<str:chart>.csv", views.report_csv, name="report-csv"),
]
