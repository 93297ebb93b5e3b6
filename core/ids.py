"""Prediction ids: 26 lowercase base32 characters, like Replicate's."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets


def new_prediction_id() -> str:
    return base64.b32encode(os.urandom(16)).decode().rstrip("=").lower()


def new_api_token() -> str:
    return "r8_" + secrets.token_urlsafe(30)


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
