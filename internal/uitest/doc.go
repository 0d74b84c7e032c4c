// Package uitest drives allot's operator page in a real browser: headless
// Chromium (Debian's chromium package), controlled over the DevTools
// protocol on a pipe (--remote-debugging-pipe), which needs neither a
// websocket client nor any module beyond the standard library. Its tests
// skip, saying how to install Chromium, when the browser is absent.
package uitest
