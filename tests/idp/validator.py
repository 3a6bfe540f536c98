from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsClaimValidator(OAuth2Validator):
    """Adds what a company's provider sends: the username, e-mail, names and the user's groups."""

    oidc_claim_scope = None  # every claim, whatever the scopes (as providers configured to send groups do)

    def get_additional_claims(self, request):
        user = request.user
        return {"preferred_username": user.username, "email": user.email, "given_name": user.first_name,
                "family_name": user.last_name, "groups": sorted(user.groups.values_list("name", flat=True))}
