"""JSON as a type, for the edges where mlenv writes or reads JSON it does not interpret key by key (state.json's
records as written, JSON Schemas, kubeconfig and API objects passed through): what ``json.dumps`` accepts and
``json.loads`` returns."""

from __future__ import annotations

from typing import TypeAlias

JSON: TypeAlias = "dict[str, JSON] | list[JSON] | str | int | float | bool | None"
JSONObject: TypeAlias = "dict[str, JSON]"
