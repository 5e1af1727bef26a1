"""What pushes leave in a sandbox, so that the next push sends only the skills that changed.

A fleet re-sent every file of every skill to every sandbox on every push. Now the record beside
the push lock (``.<DEST>.kb-record``, or ``DEST/.kb-record``) holds one line per skill pushed
there, ``NAME DIGEST SUM``:

- DIGEST is :func:`push_digest` of the tree that was sent: everything a full push sets in the
  sandbox (paths, kinds, modes, contents, link targets, and mtimes in the whole seconds tar
  carries), so an equal digest means a full push would leave the same tree;
- SUM is ``tar -c | cksum`` (or ``md5sum``, ``sha1sum``, ``sha256sum``: Debian's BusyBox has no
  cksum) of the tree as it landed, taken in the sandbox right after it was renamed in: a tree
  changed there since (by hand, by an agent) no longer sums the same, and is sent again (and
  ``--prune`` keeps it: it is no longer ours). Where none of them exists, SUM is empty and
  nothing is ever taken as held, or pruned.

A record over :data:`RECORD_LIMIT` is not read (``dd`` tells, without reading it): it is
treated as absent, with a warning.

The script speaks first (:data:`REPORT`): under the push lock, it prints ``kb-push-held TOKEN``
and ``NAME=DIGEST`` for each skill of the set it holds intact; the client streams only the
others, in the same exec call (:func:`process.feed` with ``ask``). The lock is held
from the report to the renames, so what was reported is still true when the set is put in
place. The stream's last member carries ``NAME DIGEST`` of every skill in the set, from which
:data:`RECORD` writes the new record. A transport that holds stdout back until the end gets no
answer in time and is sent everything: still one call.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
import threading
from collections.abc import Mapping
from typing import Final

from bootstrap.primitives import log, tar
from bootstrap.trees.skillmd import unsafe_name
from bootstrap.trees.skilltree import SkillTree, is_tree_hash, tree_hash

HELD: Final = "kb-push-held"
# The largest sandbox record read (a larger one is treated as absent). A line is at most ~215
# bytes (a name of the spec's 64 characters, the digest, a sha256sum), so this holds over 4,800
# skills; the script's sh reads it byte by byte (dash: ~0.7 s per MiB) on each of four passes,
# so a larger cap would only let a planted record stall every push for longer.
RECORD_LIMIT: Final = 1024 * 1024

# A push into several sandboxes hashes each tree once (the trees of one push are the same
# objects for every runtime; a later push loads new ones, so nothing stale is reused).
_DIGESTS: dict[int, tuple[SkillTree, str]] = {}
_DIGESTS_LOCK = threading.Lock()
_KEEP: Final = 256


def push_digest(tree: SkillTree) -> str:
    """``sha256:<hex>`` over the tree's content hash and the mtimes and root mode a push
    sets (whole seconds: what the tar stream carries)."""
    with _DIGESTS_LOCK:
        known = _DIGESTS.get(id(tree))
        if known is not None and known[0] is tree:
            return known[1]
        h = hashlib.sha256(tree_hash(tree).encode())
        st = os.stat(tree.root)
        h.update(b"%o %d\0" % (stat.S_IMODE(st.st_mode), st.st_mtime_ns // 1_000_000_000))
        for e in tree.entries:
            h.update(b"%s %d\0" % (e.rel.encode("utf-8", "surrogateescape"),
                                   e.mtime_ns // 1_000_000_000))
        digest = f"sha256:{h.hexdigest()}"
        if len(_DIGESTS) >= _KEEP:
            _DIGESTS.pop(next(iter(_DIGESTS)))
        _DIGESTS[id(tree)] = (tree, digest)
        return digest


def manifest(digests: Mapping[str, str]) -> bytes:
    """The stream's last member's content: ``NAME DIGEST`` for every skill of the set."""
    return "".join(f"{n} {d}\n" for n, d in digests.items()).encode()


def held(line: str | None, token: str) -> dict[str, str]:
    """The skills the sandbox says it holds intact (name -> digest), from its report line; {}
    for no line, another token, or anything that is not a skill name and a digest."""
    prefix = f"{HELD} {token}"
    if line is None or not (line == prefix or line.startswith(prefix + " ")):
        return {}
    out: dict[str, str] = {}
    for word in line[len(prefix):].split():
        name, _, digest = word.partition("=")
        if unsafe_name(name) is None and is_tree_hash(digest):
            out[name] = digest
    return out


def said(stdout: str, tag: str) -> tuple[str, ...]:
    """The skill names the script reported on lines ``TAG NAME`` (only names we could have
    pushed: the sandbox's output is not ours to trust)."""
    names = (line.removeprefix(f"{tag} ") for line in stdout.splitlines()
             if line.startswith(f"{tag} "))
    return tuple(n for n in names if unsafe_name(n) is None)


def log_notes(stdout: str, dest: str, runtime: str) -> None:
    """Tell what the script reported beside the push: a record it did not read, and the
    entries of DEST that ``--prune`` kept, and why (fixed texts: only the tags are read)."""
    ignored = set(said(stdout, "kb-push-record-ignored"))
    if ignored:
        why = (f"it is larger than {RECORD_LIMIT >> 20} MiB" if "too-large" in ignored
               else "the sandbox has no dd to read it with a bound")
        log.warning(f"ignored the push record in {runtime}: {why}; every skill was sent, "
                    "and --prune removes only what a push records from now on", dest=dest)
    changed = set(said(stdout, "kb-push-changed"))
    for name in said(stdout, "kb-push-kept"):
        why = ("replaced or changed since kernel-bootstrap pushed it" if name in changed
               else "not put there by kernel-bootstrap")
        log.info(f"kept {posixpath.join(dest, name)} in {runtime}: {why}")


def member(name: str, data: bytes) -> bytes:
    """A tar file member holding ``data`` (header, content, padding)."""
    pad = -len(data) % tar.BLOCK
    return tar.header(name, "file", 0o644, 0, len(data)) + data + bytes(pad)


# Shell fragments of the push script (bootstrap.trees.targets); POSIX sh, busybox-portable, with
# a checksum tool and dd beyond the script's own list (without them, every skill is sent).
REPORT: Final = r"""in_set() { for n in @NAMES@; do [ "$n" = "$1" ] && return 0; done; return 1; }
valid_name() { case $1 in ''|.*|*/*|*[!a-z0-9._-]*) return 1 ;; esac; return 0; }
hasher=
for tool in cksum md5sum sha1sum sha256sum; do
  if command -v "$tool" >/dev/null 2>&1; then hasher=$tool; break; fi
done
# The checksum of the tar of the named trees of DEST ("" without a tool; a tar that fails sums
# differently every time, so it never matches).
treesum() {
  [ -n "$hasher" ] || return 0
  set -- $( { tar -c -f - -C "$dest" "$@" 2>/dev/null || echo "failed $$"; } |
    "$hasher" 2>/dev/null)
  [ $# -ge 2 ] && echo "$hasher.$1.$2"
}
recorded=
sent=
whole=
intact=
if [ -f "$record" ] && [ ! -L "$record" ]; then
  take_lock
  # sh reads a record byte by byte, several times over (a 13 MB one took 16 s): one larger
  # than any real record is not read at all. dd seeks to the byte past the cap rather than
  # reading up to it, and then reads at most the cap, should the file grow in between.
  if ! command -v dd >/dev/null 2>&1; then
    echo "kb-push-record-ignored no-dd"
  elif [ "$(dd if="$record" bs=1 skip=@LIMIT@ count=1 2>/dev/null; echo .)" != . ]; then
    echo "kb-push-record-ignored too-large"
  else
    recorded=$(dd if="$record" bs=@LIMIT@ count=1 2>/dev/null) || recorded=
  fi
  # The usual case first: the same set, all of it intact, told by one tar of the whole set
  # against the sum of it the last push recorded (line "* SUM"); else skill by skill.
  whole=$(printf '%s\n' "$recorded" | while read -r n d s rest; do
    if [ "$n" = "*" ]; then echo "$s"; break; fi
  done)
  if [ -n "$whole" ] && [ "$(treesum @NAMES@)" = "$whole" ]; then intact=1; fi
  have=$(printf '%s\n' "$recorded" | while read -r name digest sum rest; do
    valid_name "$name" && in_set "$name" || continue
    case $digest in sha256:*[!0-9a-f]*|sha256:) continue ;; sha256:*) ;; *) continue ;; esac
    [ -d "$dest/$name" ] && [ ! -L "$dest/$name" ] && [ -n "$sum" ] || continue
    [ -n "$intact" ] || [ "$(treesum "$name")" = "$sum" ] || continue
    printf ' %s=%s' "$name" "$digest"
  done)
fi
echo "kb-push-held $token$have"
""".replace("@LIMIT@", str(RECORD_LIMIT))

# The new record, and --prune by the old one: a recorded skill not in the set whose tree still
# sums as it landed is moved out of DEST in one rename (a reader sees it whole or not at all);
# one replaced or edited in the sandbox since (or any, where no checksum tool can tell) is no
# longer ours: it stays, named, and leaves the record. DEST's other entries are only named
# (kept). The record is read as untrusted text (only a regular file, only lines naming a skill)
# and replaced in one rename after the removals; a push killed in between leaves names whose
# trees are gone, which the next one drops.
RECORD: Final = r""": > "$stage/record" || fail "cannot write $stage/record"
printf '%s\n' "$recorded" | while read -r name digest sum rest; do
  valid_name "$name" || continue
  in_set "$name" && continue
  [ -d "$dest/$name" ] && [ ! -L "$dest/$name" ] || continue
  if [ -z "$prune" ]; then
    printf '%s %s %s\n' "$name" "$digest" "$sum" >> "$stage/record"
  elif [ -z "$sum" ] || [ "$(treesum "$name")" != "$sum" ]; then
    echo "kb-push-changed $name"
  elif mv "$dest/$name" "$stage/old/$name"; then
    echo "kb-push-removed $name"
  else
    printf '%s %s %s\n' "$name" "$digest" "$sum" >> "$stage/record"
  fi
done
# Kept skills keep their lines (they were not sent because the digest there is the one the
# client has); each skill sent gets the manifest's digest and the sum of the tree as it landed.
printf '%s\n' "$recorded" | while read -r name digest sum rest; do
  valid_name "$name" && in_set "$name" || continue
  case " $sent " in *" $name "*) continue ;; esac
  printf '%s %s %s\n' "$name" "$digest" "$sum"
done >> "$stage/record"
while read -r name digest; do
  valid_name "$name" && in_set "$name" || continue
  case " $sent " in *" $name "*) ;; *) continue ;; esac
  printf '%s %s %s\n' "$name" "$digest" "$(treesum "$name")" >> "$stage/record"
done < "$stage/new/@MARKER@"
# The sum of the whole set: the one just checked if nothing changed, else taken anew.
if [ -z "$sent" ] && [ -n "$intact" ]; then sum=$whole; else sum=$(treesum @NAMES@); fi
printf '* - %s\n' "$sum" >> "$stage/record"
# mv onto a directory would move the file into it: a directory planted there is left alone.
if [ -d "$record" ] || ! mv -f "$stage/record" "$record"; then
  say "could not update $record; the next push sends every skill again"
fi
if [ -n "$prune" ]; then
  for path in "$dest"/*; do
    [ -e "$path" ] || [ -L "$path" ] || continue
    name=${path##*/}
    in_set "$name" || echo "kb-push-kept $name"
  done
fi"""
