"""The connection side of the HTTP providers: client, headers, error translation.

Everything httpx-specific that can fail is translated here, at one boundary, into the
`ProviderError` tree (`agentloop._errors`). Wire mapping (request bodies, event mapping)
lives in the per-API packages and never touches httpx. The modules:

- `_client`: `Connection` (one endpoint: its client, shared or owned, and the request it
  sends), `HTTPModel`, the checks of ``base_url`` and ``extra_headers``, the OpenAI headers,
  the origin (`origin_of`) that thinking blocks record;
- `_errors`: a failed response or transport failure as a `ProviderError` (error bodies read
  as far as they can be, prompt-too-long recognised, timeouts that say which wait ran out);
- `_retry`: whether a failed response is worth another attempt, and after how long;
- `_redirects`: redirects followed without taking credential headers to another origin;
- `_secrets`: the API key as a `Secret`, and the `Redactor` that scrubs it, the request's
  credential headers and the credentials in ``base_url`` out of every error and log record.
"""

from ._client import (
    Connection,
    HTTPModel,
    check_base_url,
    check_headers,
    invalid_url_kind,
    merge_headers,
    missing_key,
    openai_connection,
    openai_headers,
    origin_of,
)
from ._errors import connection_error, document_error, error_code, error_fields, prompt_too_long, status_error
from ._retry import RETRYABLE_STATUSES, parse_retry
from ._secrets import (
    Redactor,
    Secret,
    credential_parts,
    hide_url_credentials,
    is_credential,
    is_query_credential,
    resolve_key,
)

__all__ = [
    "RETRYABLE_STATUSES",
    "Connection",
    "HTTPModel",
    "Redactor",
    "Secret",
    "check_base_url",
    "check_headers",
    "connection_error",
    "credential_parts",
    "document_error",
    "error_code",
    "error_fields",
    "hide_url_credentials",
    "invalid_url_kind",
    "is_credential",
    "is_query_credential",
    "merge_headers",
    "missing_key",
    "openai_connection",
    "openai_headers",
    "origin_of",
    "parse_retry",
    "prompt_too_long",
    "resolve_key",
    "status_error",
]
