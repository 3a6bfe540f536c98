"""Sign-in against a real OpenLDAP server (Debian's slapd, started on a free port with its own directory):
the password is checked by the directory, the account is made from its attributes, and teams follow the
user's groupOfNames memberships, through the sign-in page and the token endpoint."""
from __future__ import annotations

import os
import subprocess
import sys

import ldap
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django_auth_ldap.config import GroupOfNamesType, LDAPSearch

from teams.models import GroupMapping, Membership
from tests.conftest import free_port, start_server, stop_process_group

pytestmark = pytest.mark.django_db(transaction=True)

SUFFIX = "dc=example,dc=com"
ADMIN_DN, ADMIN_PASSWORD = f"cn=admin,{SUFFIX}", "directory-admin-secret"
ERIN_DN, ERIN_PASSWORD = f"uid=erin,ou=people,{SUFFIX}", "erin-Pass-2026!"
ML_GROUP = f"cn=GPU-ML,ou=groups,{SUFFIX}"


@pytest.fixture
def slapd(tmp_path, settings):
    if not os.path.exists("/usr/sbin/slapd"):
        pytest.fail("LDAP tests need Debian's slapd (scripts/test-services installs it)")
    data = tmp_path / "ldap-data"
    data.mkdir()
    config = tmp_path / "slapd.conf"
    config.write_text("\n".join([
        *(f"include /etc/ldap/schema/{name}.schema" for name in ("core", "cosine", "inetorgperson", "nis")),
        "modulepath /usr/lib/ldap", "moduleload back_mdb", f"pidfile {tmp_path}/slapd.pid",
        "database mdb", f'suffix "{SUFFIX}"', f'rootdn "{ADMIN_DN}"', f"rootpw {ADMIN_PASSWORD}",
        f"directory {data}", "maxsize 10485760", ""]))
    uri = f"ldap://127.0.0.1:{free_port()}"

    def answers() -> bool:
        try:
            connection = ldap.initialize(uri)
            connection.simple_bind_s(ADMIN_DN, ADMIN_PASSWORD)
            return True
        except ldap.LDAPError:
            return False

    process = start_server(["/usr/sbin/slapd", "-f", str(config), "-h", f"{uri}/", "-d", "0"], env=dict(os.environ),
                           log_path=tmp_path / "slapd.log", ready=answers, what="slapd")
    directory = ldap.initialize(uri)
    directory.simple_bind_s(ADMIN_DN, ADMIN_PASSWORD)
    entries = [
        (SUFFIX, {"objectClass": [b"dcObject", b"organization"], "dc": [b"example"], "o": [b"Example"]}),
        (f"ou=people,{SUFFIX}", {"objectClass": [b"organizationalUnit"], "ou": [b"people"]}),
        (f"ou=groups,{SUFFIX}", {"objectClass": [b"organizationalUnit"], "ou": [b"groups"]}),
        (ERIN_DN, {"objectClass": [b"inetOrgPerson"], "uid": [b"erin"], "cn": [b"Erin Wu"], "sn": [b"Wu"],
                   "givenName": [b"Erin"], "mail": [b"erin@example.com"], "userPassword": [ERIN_PASSWORD.encode()]}),
        (ML_GROUP, {"objectClass": [b"groupOfNames"], "cn": [b"GPU-ML"], "member": [ERIN_DN.encode()]}),
    ]
    for dn, attributes in entries:
        directory.add_s(dn, list(attributes.items()))
    # As config/settings.py builds them from LDAP_* when LDAP_SERVER_URI is set.
    settings.AUTH_LDAP_SERVER_URI = uri
    settings.AUTH_LDAP_BIND_DN, settings.AUTH_LDAP_BIND_PASSWORD = ADMIN_DN, ADMIN_PASSWORD
    settings.AUTH_LDAP_USER_SEARCH = LDAPSearch(f"ou=people,{SUFFIX}", ldap.SCOPE_SUBTREE, "(uid=%(user)s)")
    settings.AUTH_LDAP_USER_ATTR_MAP = {"first_name": "givenName", "last_name": "sn", "email": "mail"}
    settings.AUTH_LDAP_GROUP_SEARCH = LDAPSearch(f"ou=groups,{SUFFIX}", ldap.SCOPE_SUBTREE,
                                                 "(objectClass=groupOfNames)")
    settings.AUTH_LDAP_GROUP_TYPE = GroupOfNamesType()
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS[:2], "teams.ldap.PortalLDAPBackend",
                                        *settings.AUTHENTICATION_BACKENDS[2:]]
    directory.uri = uri
    yield directory
    stop_process_group(process)


def _sign_in(password=ERIN_PASSWORD):
    client = Client()
    answer = client.post("/login/", {"username": "erin", "password": password})
    return client, answer


def test_a_directory_user_signs_in_and_joins_the_teams_of_their_groups(world, slapd):
    GroupMapping.objects.create(group=ML_GROUP.lower(), team=world.team, role="manager")  # case does not matter
    client, answer = _sign_in()
    assert answer.status_code == 302 and answer["Location"] == "/"
    erin = get_user_model().objects.get(username="erin")
    assert (erin.first_name, erin.last_name, erin.email) == ("Erin", "Wu", "erin@example.com")
    assert Membership.objects.get(user=erin).role == "manager"
    assert client.get("/").status_code == 200
    # A wrong password is the directory's refusal.
    assert _sign_in("wrong")[1].status_code == 200 and not _sign_in("wrong")[0].session.get("_auth_user_id")


def test_leaving_the_group_in_the_directory_leaves_the_team_at_the_next_sign_in(world, slapd, api):
    GroupMapping.objects.create(group=ML_GROUP, team=world.team, role="member")
    _sign_in()
    assert Membership.objects.filter(user__username="erin", team=world.team).exists()
    slapd.modify_s(ML_GROUP, [(ldap.MOD_REPLACE, "member", [ADMIN_DN.encode()])])
    # The token endpoint signs in through the same backends.
    token = api().post("/api/v1/auth/token/", {"username": "erin", "password": ERIN_PASSWORD}, format="json")
    assert token.status_code == 200
    assert not Membership.objects.filter(user__username="erin").exists()


def test_the_environment_builds_the_ldap_settings(tmp_path):
    env = {**os.environ, "LDAP_SERVER_URI": "ldap://directory.example.com", "LDAP_BIND_DN": ADMIN_DN,
           "LDAP_USER_SEARCH_BASE": f"ou=people,{SUFFIX}", "LDAP_GROUP_SEARCH_BASE": f"ou=groups,{SUFFIX}",
           "LDAP_GROUP_TYPE": "posix", "SECRET_KEY": "x", "DJANGO_SETTINGS_MODULE": "config.settings"}
    code = ("import django; django.setup(); from django.conf import settings as s; "
            "print(s.AUTH_LDAP_SERVER_URI, type(s.AUTH_LDAP_GROUP_TYPE).__name__, "
            "'teams.ldap.PortalLDAPBackend' in s.AUTHENTICATION_BACKENDS, s.AUTH_LDAP_USER_SEARCH.filterstr)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["ldap://directory.example.com", "PosixGroupType", "True", "(uid=%(user)s)"]
