"""What the ctxcore API (``workers.http``), the proxy (``workers.proxy``), the web inspector
(``workers.ui``) and admission (``workers.admission``) share, below all four so none imports
another: the state the routes share (``state.ApiState``), the bearer token and rate limit
(``auth``), the error a route raises (``errors.ApiError``) and the table of statuses every
``CtxcoreError`` is answered with (``error_statuses``)."""
