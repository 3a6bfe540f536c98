"""One date and time format for people, 24-hour with the zone (portal/timezones.py writes the pages' times;
these are what Django itself formats and parses: the admin, {{ value }} of a datetime, form input)."""
DATE_FORMAT = "D j M Y"
TIME_FORMAT = "H:i"
DATETIME_FORMAT = "D j M Y H:i T"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i"
FIRST_DAY_OF_WEEK = 1
DATE_INPUT_FORMATS = ["%Y-%m-%d"]
TIME_INPUT_FORMATS = ["%H:%M", "%H:%M:%S"]
DATETIME_INPUT_FORMATS = ["%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
