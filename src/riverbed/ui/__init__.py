"""riverbed ui: the web console over the read model (:mod:`riverbed.inspect`).

``riverbed ui`` builds the app with :func:`riverbed.ui.app.create_app` and a sampler
(:class:`riverbed.ui.console.Console`); they load Starlette and Jinja2, so this package
imports neither until asked.
"""

from __future__ import annotations

__all__: list[str] = []
