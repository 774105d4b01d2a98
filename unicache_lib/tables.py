"""Small tables shown whole in a notebook: every cell wrapped, nothing cut to pandas' 50 characters.

:class:`WrappedTable` renders a DataFrame as HTML with wrapping cells (what JupyterLab and GitHub show) and as
plain text with one block per row, each field on its own wrapped lines (what a committed notebook's text
output and nbval compare), e.g. the decision tables "measurement -> what to do on your model".
"""
from __future__ import annotations

import textwrap
from html import escape

from .core.errors import InputError


class WrappedTable:
    """``WrappedTable(df)`` as a cell's last expression (or ``display(...)``) shows ``df`` whole.

    Plain text: per row, the first column's value as a heading, then ``column  value`` lines wrapped at ``width``
    characters (long words are not broken, so nothing is altered but whitespace). A subclass changes what a block
    shows through :attr:`fields`, :meth:`heading` and :meth:`text` (the scoreboard does).
    """

    def __init__(self, df, width: int = 100):
        if df is None or not len(df.columns):
            raise InputError("WrappedTable needs a DataFrame with at least one column")
        self.df = df.reset_index(drop=True)
        self.width = int(width)

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
        label = 2 + max((len(str(c)) for c in self.fields), default=0) + 2
        lines = []
        for key, row in self.df.iterrows():
            lines.append(self.heading(key, row))
            for c in self.fields:
                text = self.text(c, row[c])
                if text is None:
                    continue
                wrapped = textwrap.wrap(text, max(20, self.width - label), break_long_words=False,
                                        break_on_hyphens=False) or [""]
                lines += [f"  {str(c) if i == 0 else '':<{label - 2}}{w}" for i, w in enumerate(wrapped)]
            lines.append("")
        return "\n".join(lines).rstrip() + "\n"

    def _repr_html_(self) -> str:
        cell = 'style="text-align:left; vertical-align:top; white-space:pre-wrap"'
        head = "".join(f"<th {cell}>{escape(str(c))}</th>" for c in self.df.columns)
        body = "".join("<tr>" + "".join(f"<td {cell}>{escape(str(v))}</td>" for v in row) + "</tr>"
                       for row in self.df.itertuples(index=False))
        return f'<table class="unicache-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
