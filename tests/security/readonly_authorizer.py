"""A jupyter_server Authorizer that allows reading only (loaded by the test server by name)."""

from jupyter_server.auth.authorizer import Authorizer


class ReadOnlyAuthorizer(Authorizer):
    """Every resource may be read; nothing may be written or executed."""

    def is_authorized(self, handler, user, action, resource):
        return action == "read"
