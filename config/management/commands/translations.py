"""`manage.py translations`: rebuild and compile the zh-Hans catalogues; `--check`: fail on a string that
is not marked, not translated or not compiled (config/translations.py says what each fault means)."""
from django.core.management.base import BaseCommand, CommandError

from config import translations


class Command(BaseCommand):
    help = "Rebuild and compile the zh-Hans catalogues, or (--check) list what is not marked or translated."

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="change nothing; exit 1 listing every fault")

    def handle(self, *args, check: bool = False, **options):
        if not check:
            translations.rebuild()
            self.stdout.write("Catalogues rebuilt and compiled; translate the entries with an empty msgstr.")
            return
        faults = translations.check()
        for fault in faults:
            self.stdout.write(fault)
        if faults:
            raise CommandError(f"{len(faults)} translation faults")
        self.stdout.write("Every string is marked, translated and compiled.")
