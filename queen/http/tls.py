"""The server's TLS settings: one place that turns --tls-cert/--tls-key into an ssl.SSLContext.

Owns: the protocol floor (TLS 1.2; the standard library's defaults for ciphers and the rest) and
an error that names the file that could not be loaded. Connections use the context through
trio.SSLStream (queen/http/connection.py); SIGHUP builds a new one from the same paths.
"""

from __future__ import annotations

import ssl


class TlsSetupError(Exception):
    """The certificate or key could not be loaded; `path` is the file to look at."""

    def __init__(self, path: str, detail: str):
        super().__init__(f"cannot load {path}: {detail}")
        self.path = path
        self.detail = detail


def server_context(cert_path: str, key_path: str) -> ssl.SSLContext:
    """A server-side context serving the certificate chain in cert_path with the key in key_path
    (both PEM). Raises TlsSetupError naming the file at fault."""
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
    return context
