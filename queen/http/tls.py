"""The server's TLS settings: one place that turns --tls-cert/--tls-key into an ssl.SSLContext.

Owns: the protocol floor (TLS 1.2; the standard library's defaults for ciphers and the rest), an
error that names the file that could not be loaded, and the warning for a key file that others
may read. Connections use the context through trio.SSLStream (queen/http/connection.py); SIGHUP
builds a new one from the same paths.
"""

from __future__ import annotations

import logging
import os
import ssl

logger = logging.getLogger(__name__)


class TlsSetupError(Exception):
    """The certificate or key could not be loaded; `path` is the file to look at."""

    def __init__(self, path: str, detail: str):
        super().__init__(f"cannot load {path}: {detail}")
        self.path = path
        self.detail = detail


def server_context(cert_path: str, key_path: str) -> ssl.SSLContext:
    """A server-side context serving the certificate chain in cert_path with the key in key_path
    (both PEM). Raises TlsSetupError naming the file at fault. A key file that its group or
    others may read is warned about (one log line), each time it is loaded."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain's errors do not say which of the two files they mean, so the certificates
    # are read on their own first: whatever fails after that is the key's.
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=cert_path)
    except ssl.SSLError as error:
        raise TlsSetupError(cert_path, f"no PEM certificate in it ({error.reason})") from None
    except OSError as error:
        raise TlsSetupError(cert_path, error.strerror or str(error)) from None

    def no_password():
        # Without this, OpenSSL would ask for the passphrase on the terminal and the server would hang.
        raise TlsSetupError(key_path, "the key is encrypted; give an unencrypted PEM key")

    try:
        context.load_cert_chain(cert_path, key_path, password=no_password)
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise TlsSetupError(key_path, f"the key does not belong to the certificate in {cert_path}") from None
        raise TlsSetupError(key_path, "no usable PEM private key in it") from None
    except OSError as error:
        raise TlsSetupError(key_path, error.strerror or str(error)) from None
    mode = os.stat(key_path).st_mode & 0o777
    if mode & 0o077:
        logger.warning("event=tls_key_readable_by_others file=%s mode=%o hint='chmod 600 it: whoever reads the key "
                       "can pose as this server'", key_path, mode)
    return context
