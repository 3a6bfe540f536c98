// Tell the portal the browser's time zone: it shows every time in it and reads the forms' times in it
// (portal/timezones.py). A page rendered for a GET before the portal knew the zone is shown again once.
(function () {
  "use strict";
  let zone;
  try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone; } catch (e) { return; }
  // IANA names ("Asia/Shanghai", "Etc/GMT+8") are cookie-safe as they are; the server reads them raw.
  if (!zone || !/^[A-Za-z0-9_+\-\/]+$/.test(zone)) return;
  const cookie = "tz=" + zone;
  if (document.cookie.split("; ").includes(cookie)) return;
  document.cookie = cookie + "; path=/; max-age=31536000; SameSite=Lax";
  const script = document.currentScript;
  if (script && script.dataset.reload === "yes" && script.dataset.zone !== zone) location.reload();
})();
