"""gpupool, the command line of GPU Pool Portal. It talks only to the portal's REST API (/api/v1/)
with a personal API token; it imports nothing of the portal."""
