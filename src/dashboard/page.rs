//! The dashboard page: one HTML document with its CSS and JavaScript inlined, embedded in
//! the binary at compile time. No CDN, no fonts, no network beyond this server's own API.

use std::sync::OnceLock;

const TEMPLATE: &str = include_str!("page/index.html");
const STYLE: &str = include_str!("page/style.css");
const SCRIPT: &str = include_str!("page/app.js");

/// The complete page (assembled once).
pub fn html() -> &'static str {
    static PAGE: OnceLock<String> = OnceLock::new();
    PAGE.get_or_init(|| {
        TEMPLATE
            .replacen("/*@STYLE@*/", STYLE, 1)
            .replacen("/*@SCRIPT@*/", SCRIPT, 1)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn page_is_self_contained() {
        let page = super::html();
        assert!(!page.contains("/*@"), "a placeholder was not filled");
        assert!(page.contains("id=\"actors\"") && page.contains("EventSource"));
        for needle in ["http://", "https://", "//cdn", "@import"] {
            assert!(
                !page.contains(needle),
                "page references the network: {needle}"
            );
        }
    }
}
