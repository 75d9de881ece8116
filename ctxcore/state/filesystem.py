"""Offloaded originals as JSON files: ``{root}/{tenant}/{conversation}/{handle}.json``.

Ids are validated by ``ConversationKey`` and handles here, so a crafted id cannot name a
path outside the root. Files are written atomically (temp file + rename) with mode 0600.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ctxcore.errors import InvalidKeyError, StoreUnavailable
from ctxcore.messages import AnyMessage, messages_from_json, messages_to_json
from ctxcore.state.keys import ConversationKey

if TYPE_CHECKING:
    from ctxcore.state.base import FileKeeper, OffloadStore

__all__ = ["FilesystemOffloadStore", "no_files", "put_one", "validate_handle"]

_HANDLE = re.compile(r"[0-9a-f]{8,64}")


def validate_handle(handle: object) -> str:
    """Handles are lowercase hex (8-64 characters)."""
    if not isinstance(handle, str) or _HANDLE.fullmatch(handle) is None:
        raise InvalidKeyError(f"invalid offload handle {handle!r}: expected 8-64 lowercase hex characters")
    return handle


def put_one(store: OffloadStore, key: ConversationKey, handle: str, messages: Sequence[AnyMessage]) -> bool:
    """``OffloadStore.put_if_absent`` on top of ``put_many_if_absent``."""
    return store.put_many_if_absent(key, [(handle, messages)])[0]


def no_files(store: OffloadStore) -> FileKeeper | None:
    """``OffloadStore.files`` of a store that addresses offloads by handle only: None."""
    return None


class FilesystemOffloadStore:
    """Offloads as files under ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()

    def _dir(self, key: ConversationKey) -> Path:
        return self.root / key.tenant_id / key.conversation_id

    def path_for(self, key: ConversationKey, handle: str) -> Path:
        """Where ``handle``'s file lives (whether or not it exists)."""
        return self._dir(key) / f"{validate_handle(handle)}.json"

    def put_if_absent(self, key: ConversationKey, handle: str, messages: Sequence[AnyMessage]) -> bool:
        """Write the file unless it exists; the write is atomic."""
        path = self.path_for(key, handle)
        if path.exists():
            return False
        payload = json.dumps(
            {"offload_handle": handle, "messages": json.loads(messages_to_json(messages))}, ensure_ascii=False
        )
        # link() fails if another writer got there first: first write wins, no overwrite.
        return self._write(path, payload.encode(), os.link, "offload")

    def put_many_if_absent(
        self, key: ConversationKey, items: Sequence[tuple[str, Sequence[AnyMessage]]]
    ) -> list[bool]:
        """``put_if_absent`` of each item (one file each: there is no round trip to save)."""
        for handle, _ in items:
            validate_handle(handle)
        return [self.put_if_absent(key, handle, messages) for handle, messages in items]

    def get(self, key: ConversationKey, handle: str) -> list[AnyMessage] | None:
        """The stored messages, or None."""
        path = self.path_for(key, handle)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreUnavailable(f"cannot read offload file {path}: {exc}") from exc
        return messages_from_json(json.dumps(data["messages"]))

    def archive_path(self, key: ConversationKey) -> Path:
        """Where the conversation's recall index is kept (``archive.sqlite`` in its folder)."""
        return self._dir(key) / "archive.sqlite"

    def _checked(self, path: Path) -> Path:
        # Ids are validated, but a symlink planted under the root could still lead outside.
        for part in (path, *path.parents):
            if part == self.root:
                break
            if part.is_symlink():
                raise InvalidKeyError(f"refusing {path}: {part} is a symbolic link")
        if not path.resolve().is_relative_to(self.root):
            raise InvalidKeyError(f"refusing {path}: it resolves outside {self.root}")
        return path

    def put_archive(self, key: ConversationKey, data: bytes) -> None:
        """Replace the conversation's recall index (atomic: temp file + rename, mode 0600)."""
        self._write(self._checked(self.archive_path(key)), data, os.replace, "archive")

    def _write(self, path: Path, data: bytes, place: Callable[[str, Path], None], what: str) -> bool:
        """Write ``data`` to a temp file (mode 0600) beside ``path`` and ``place`` it there;
        False when ``place`` found the file there already."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._checked(path.parent)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                place(tmp, path)
            except FileExistsError:
                return False
            finally:
                Path(tmp).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot write {what} file {path}: {exc}") from exc
        return True

    def get_archive(self, key: ConversationKey) -> bytes | None:
        """The conversation's recall index, or None."""
        path = self._checked(self.archive_path(key))
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreUnavailable(f"cannot read archive file {path}: {exc}") from exc

    def files(self) -> FileKeeper | None:
        """This store: markers name its files, and it keeps each context's recall index."""
        return self

    def delete(self, key: ConversationKey) -> None:
        """Remove the conversation's folder."""
        shutil.rmtree(self._dir(key), ignore_errors=True)
