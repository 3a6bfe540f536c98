"""The pages: dashboard, reservation form and lists, team pages (views, forms, templates/portal/).

Its migrations hold the history of the teams' models, which lived here until they moved to `teams`."""
