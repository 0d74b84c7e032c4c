// Package uitest drives allot's operator page in a real browser: headless
// Chromium (Debian's chromium package), controlled with chromedp. Its tests
// skip, saying how to install Chromium, when the browser is absent.
package uitest
