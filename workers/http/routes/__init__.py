"""The API's routers, one module per resource; ``workers.http.app`` includes them."""
