// Package console holds the operator console's test in a real browser:
// Debian's chromium, headless, driven by chromedp, against a running
// worker on a real Postgres and Kafka. It runs with
// EXACTLY_BROWSER_TEST=1 (make test-console; .ci/run installs chromium
// first) and skips otherwise.
package console
