"""Small tables shown whole in a notebook: every cell wrapped, nothing cut to pandas' 50 characters.

:class:`WrappedTable` renders a DataFrame as HTML with wrapping cells (what JupyterLab and GitHub show) and as
plain text with one short block per row, each field a ``label: text`` line wrapped at the width (what a committed
notebook's text output and nbval compare), e.g. the decision tables "measurement -> what to do on your model"; a
decision table holds at most eight rows (tests/test_output_limits.py), a longer one goes to a CSV.
"""
import textwrap

from .core.errors import InputError
from .core.untrusted import html_text


WIDTH = 110  # the widest printed line a lesson shows (tests/test_output_limits.py)


def wrap(text, width: int = WIDTH, indent: str = "  ") -> str:
    """``text`` with each of its lines wrapped at ``width`` characters, the continuation lines indented by ``indent``
    more than the line they continue (words are never broken, so nothing changes but whitespace):
    ``print(wrap(f"..."))`` for a printed sentence that may run past a page's width."""
    def one(line):
        lead = line[:len(line) - len(line.lstrip())]
        return "\n".join(textwrap.wrap(line, width, subsequent_indent=lead + indent, break_long_words=False,
                                       break_on_hyphens=False)) or line
    return "\n".join(one(line) for line in str(text).split("\n"))


class WrappedTable:
    """``WrappedTable(df)`` as a cell's last expression (or ``display(...)``) shows ``df`` whole.

    Plain text: per row, the first column's value as a heading, then one ``  column: value`` line per other column,
    each wrapped at ``width`` characters with an indented continuation (long words are not broken, so nothing is
    altered but whitespace); no blank line between rows, so eight rows of four columns fit in 40 lines. A subclass
    changes what a block shows through :attr:`fields`, :meth:`heading` and :meth:`text`.
    """

    def __init__(self, df, width: int = WIDTH):
        if df is None or not len(df.columns):
            raise InputError("WrappedTable needs a DataFrame with at least one column")
        self.df, self.width = df.reset_index(drop=True), int(width)

    @property
    def fields(self) -> list:
        """The columns written under each row's heading, in order."""
        return list(self.df.columns)[1:]

    def heading(self, key, row) -> str:
        return str(row[self.df.columns[0]])

    def text(self, field, value) -> str | None:
        """A field's text, or None to leave the field out of this row's block."""
        return str(value)

    def __repr__(self) -> str:
        wrap = dict(width=max(40, self.width), break_long_words=False, break_on_hyphens=False, subsequent_indent="    ")
        lines = []
        for key, row in self.df.iterrows():
            lines += textwrap.wrap(self.heading(key, row), **wrap) or [""]
            lines += [line for c in self.fields if (text := self.text(c, row[c])) is not None
                      for line in textwrap.wrap(f"{c}: {text}", initial_indent="  ", **wrap)]
        return "\n".join(lines) + "\n"

    def _repr_html_(self) -> str:
        cell = 'style="text-align:left; vertical-align:top; white-space:pre-wrap"'
        head = "".join(f"<th {cell}>{html_text(c)}</th>" for c in self.df.columns)
        body = "".join("<tr>" + "".join(f"<td {cell}>{html_text(v)}</td>" for v in row) + "</tr>"
                       for row in self.df.itertuples(index=False))
        return f'<table class="unicache-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
