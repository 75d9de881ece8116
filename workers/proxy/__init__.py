"""The OpenAI-compatible proxy (``POST /v1/chat/completions``): ``routes`` is the FastAPI
router; ``request`` reads what a request asks, ``match`` and ``index`` align it with the log,
``flow`` appends and serves the window, ``upstream`` and ``stream`` talk to the upstream API,
``errors`` answers in OpenAI's error shape."""
