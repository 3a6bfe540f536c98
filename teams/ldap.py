"""Sign-in against LDAP or Active Directory (django-auth-ldap), for sites without an OpenID Connect
provider. On only when LDAP_SERVER_URI is set (config/settings.py builds the AUTH_LDAP_* settings from
the environment): python-ldap, which it needs, is compiled against libldap, so the embedded demo does not
install it (requirements-ldap.txt; the test environment does).

At each sign-in the user's group DNs (found under LDAP_GROUP_SEARCH_BASE) set their memberships of the
teams staff mapped those groups to (teams/identity.py). DNs are compared without regard to case, as
directories do."""
from __future__ import annotations

from django_auth_ldap.backend import LDAPBackend

from teams.identity import memberships_follow_groups
from teams.models import GroupMapping


class PortalLDAPBackend(LDAPBackend):
    def authenticate_ldap_user(self, ldap_user, password):
        user = super().authenticate_ldap_user(ldap_user, password)
        if user is not None:
            dns = {dn.lower() for dn in ldap_user.group_dns}
            mapped = [group for group in GroupMapping.objects.values_list("group", flat=True).distinct()
                      if group.lower() in dns]
            memberships_follow_groups(user=user, groups=mapped, source="ldap")
        return user
