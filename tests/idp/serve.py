"""Start the test identity provider: `python -m tests.idp.serve --port P --redirect-uri URI --client-id ID
--client-secret S --users JSON`. It migrates its own SQLite database, makes the users and their groups
and one confidential client (RS256 ID tokens, no consent screen), then serves until killed."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redirect-uri", required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--client-secret", required=True)
    parser.add_argument("--users", required=True, help='[{"username", "password", "email", "groups": [...]}]')
    parser.add_argument("--state-dir", required=True)
    args = parser.parse_args()

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    state = Path(args.state_dir)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_file = state / "idp-key.pem"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    os.environ.update(DJANGO_SETTINGS_MODULE="tests.idp.settings", IDP_DATABASE=str(state / "idp.sqlite3"),
                      IDP_RSA_KEY_FILE=str(key_file))
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.core.servers.basehttp import WSGIServer, run
    from django.core.wsgi import get_wsgi_application
    from oauth2_provider.models import Application

    call_command("migrate", verbosity=0)
    for spec in json.loads(args.users):
        user = User.objects.create_user(spec["username"], email=spec.get("email", ""), password=spec["password"],
                                        first_name=spec.get("first_name", ""))
        for name in spec.get("groups", []):
            user.groups.add(Group.objects.get_or_create(name=name)[0])
    Application.objects.create(
        client_id=args.client_id, client_secret=args.client_secret, name="GPU Pool Portal (test)",
        client_type=Application.CLIENT_CONFIDENTIAL, authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=args.redirect_uri, algorithm=Application.RS256_ALGORITHM, skip_authorization=True)
    print("idp ready", flush=True)
    run("127.0.0.1", args.port, get_wsgi_application(), threading=True, server_cls=WSGIServer)


if __name__ == "__main__":
    sys.exit(main())
