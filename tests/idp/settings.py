"""A real OpenID Connect provider for the single sign-on tests: django-oauth-toolkit's, in its own
process and its own SQLite database (tests/idp/serve.py starts it). Nothing here is the portal's."""
import os
from pathlib import Path

SECRET_KEY = "idp-test-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions", "oauth2_provider"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "tests.idp.urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["IDP_DATABASE"]}}
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates",
              "DIRS": [Path(__file__).parent / "templates"],
              "OPTIONS": {"context_processors": ["django.template.context_processors.request"]}}]
USE_TZ = True
# Another name than the portal's: both run on 127.0.0.1-ish hosts in the tests.
SESSION_COOKIE_NAME = "idp_session"
CSRF_COOKIE_NAME = "idp_csrf"
LOGIN_URL = "/accounts/login/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": Path(os.environ["IDP_RSA_KEY_FILE"]).read_text(),
    "PKCE_REQUIRED": True,  # a client that sends no code_verifier is refused: the tests prove ours does
    "OAUTH2_VALIDATOR_CLASS": "tests.idp.validator.GroupsClaimValidator",
    "SCOPES": {"openid": "OpenID Connect", "profile": "Profile", "email": "E-mail"},
}
