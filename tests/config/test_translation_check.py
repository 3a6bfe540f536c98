"""The check behind `manage.py translations --check` finds text people would read in English."""
from __future__ import annotations

from config.translations import python_faults, template_texts


def test_template_text_outside_translate_tags_is_found():
    found = template_texts('{% load i18n %}<h1>{% translate "Pools" %}</h1><p>Free GPUs: {{ free }}</p>'
                           '<button title="Release it now">{% translate "Release" %}</button>')
    assert found == ["Free GPUs:", "Release it now"]


def test_marked_text_code_and_names_are_not_found():
    assert template_texts('{% load i18n %}{% blocktranslate with n=count %}{{ n }} GPUs free{% endblocktranslate %}'
                          '<code>kubectl get pods</code><script>const words = "not shown";</script>'
                          '<td>GPU</td><td>80 GiB</td><td>{{ value }} MHz</td><span>—</span>'
                          '{% comment %}a note for developers{% endcomment %}') == []


def test_a_tag_inside_an_attribute_does_not_hide_the_text_after_it():
    assert template_texts('<a href="{% url "x" %}">Open the pool</a>') == ["Open the pool"]


def test_literal_messages_in_python_are_found():
    source = '''
from common.errors import Conflict
from django.utils.translation import gettext as _
raise Conflict(f"Pool {slug} is full", rule="no_room")
raise Conflict(_("Pool %(pool)s is full") % {"pool": slug}, rule="no_room")
messages.success(request, "Saved.")
name = models.CharField(verbose_name="display name", help_text=_("Shown to people"))
class Role(models.TextChoices):
    MEMBER = "member", "Member"
    MANAGER = "manager", _("Manager")
class Meta:
    verbose_name = "API token"
raise ValidationError({"ends_at": "must be after starts_at"})
raise ValidationFailed(message, field="gpus", rule="min_value")
'''
    assert python_faults(source) == [(4, "Conflict(…) message"), (6, "success(…) message"),
                                     (7, "verbose_name="), (9, "choice label"), (12, "verbose_name"),
                                     (13, "ValidationError(…) message")]


def test_every_string_is_marked_translated_and_compiled():
    """The check itself (`manage.py translations --check`), on this tree: CI fails on any fault."""
    from config.translations import check

    faults = check()
    assert faults == [], "\n".join(faults)
