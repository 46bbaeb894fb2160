//! `report.html`: the report's sections ([`super::sections`]) on one self-contained page
//! (inline CSS and SVG charts, no script, no external reference).

use std::fmt::Write as _;

use super::{
    json::Report,
    sections::{Block, banner, sections},
    svg::{STYLE, escape},
};

const PAGE_STYLE: &str = "body{font:14px/1.4 sans-serif;margin:24px;color:#222;max-width:1340px}\
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}\
th{background:#f0f0f0}.pass{color:#070;font-weight:bold}.fail{color:#b00;font-weight:bold}\
.banner{font-size:20px;padding:8px 12px;display:inline-block;border-radius:4px}\
.banner.pass{background:#e3f6e3}.banner.fail{background:#fbe3e3}.charts{display:flex;flex-wrap:wrap}";

/// `**bold**` and `` `code` `` of a section's text as HTML, everything else escaped.
fn inline(text: &str) -> String {
    let mut o = String::new();
    for (i, part) in escape(text).split("**").enumerate() {
        if i % 2 == 1 {
            let _ = write!(o, "<b>{part}</b>");
        } else {
            for (j, bit) in part.split('`').enumerate() {
                if j % 2 == 1 {
                    let _ = write!(o, "<code>{bit}</code>");
                } else {
                    o.push_str(bit);
                }
            }
        }
    }
    o
}

/// report.html: the sections of [`super::sections`] on one self-contained page.
pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let verdict = if r.passed { "pass" } else { "fail" };
    let _ = write!(
        o,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>goodput replay report</title><style>{PAGE_STYLE}{STYLE}</style></head><body>"
    );
    let _ = write!(
        o,
        "<h1>goodput replay: acceptance report</h1><p class=\"banner {verdict}\">{}</p>",
        escape(&banner(r))
    );
    for sec in sections(r) {
        if let Some(t) = sec.title {
            let _ = write!(o, "<h2>{}</h2>", escape(t));
        }
        for b in sec.blocks {
            match b {
                Block::Text(t) => {
                    let _ = write!(o, "<p>{}</p>", inline(&t));
                }
                Block::Items(items) => {
                    o.push_str("<ul>");
                    for i in items {
                        let _ = write!(o, "<li>{}</li>", inline(&i));
                    }
                    o.push_str("</ul>");
                }
                Block::Table(t) => o.push_str(&t.html()),
                Block::Charts(charts) => {
                    o.push_str("<div class=\"charts\">");
                    for c in charts {
                        o.push_str(&c.render());
                    }
                    o.push_str("</div>");
                }
            }
        }
    }
    o.push_str("</body></html>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_markup_is_the_only_markup() {
        assert_eq!(
            inline("a **b** `c<d>` e"),
            "a <b>b</b> <code>c&lt;d&gt;</code> e"
        );
    }
}
