"""The embedded hub's HTTP side (``modelpatch hub serve``): the Starlette app, routes, tokens,
and what every route shares. Needs the ``modelpatch[hub]`` extra.

May import ``errors``, ``hub.request_errors`` and ``hub.store``."""
