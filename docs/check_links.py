"""Check every relative link of the built site: its file exists and its ``#anchor`` is in it.

``make docs`` runs it after Sphinx::

    python docs/check_links.py docs/_build/html

It reads every ``.html`` page under the folder, collects the ``id`` (and ``name``) attributes
of each, and checks each ``href`` and ``src`` that is not an absolute URL (``http:``,
``mailto:``, ...): the file it points to must exist, and a fragment must name an id of that
page (an empty fragment, ``#``, is allowed). Links into the copied MathJax and Sphinx's own
search page are not special-cased: they must resolve like any other. Prints one line per
dead link and exits 1 if there is any.
"""

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    """The ids and the relative links of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if value is None:
                continue
            if key == "id" or (key == "name" and tag == "a"):
                self.ids.add(value)
            elif (key == "href" and tag in ("a", "link")) or (key == "src" and tag in ("img", "script")):
                self.links.append(value)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    return page


def dead_links(site: Path) -> list[str]:
    """Return ``"page: link (why)"`` for every relative link of ``site`` that does not resolve."""
    pages = {path.resolve(): _parse(path) for path in sorted(site.rglob("*.html"))}
    dead = []
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc:  # http:, https:, mailto:, data:, //host
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            where = f"{path.relative_to(site.resolve())}: {link}"
            if not target.exists():
                dead.append(f"{where} (no such file)")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if fragment not in ids:
                    dead.append(f"{where} (no #{fragment} in {target.name})")
    return dead


def main(argv: list[str] | None = None) -> int:
    """Check the site folder given as the only argument; exit 1 on a dead link."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python docs/check_links.py SITE_FOLDER", file=sys.stderr)
        return 2
    site = Path(args[0])
    dead = dead_links(site)
    for line in dead:
        print(line)
    n_pages = sum(1 for _ in site.rglob("*.html"))
    print(f"check_links: {n_pages} pages, {len(dead)} dead links", file=sys.stderr)
    return 1 if dead else 0


if __name__ == "__main__":
    sys.exit(main())
