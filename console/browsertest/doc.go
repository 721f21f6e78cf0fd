// Package browsertest drives the operators' console (package console) in a
// real browser: headless Chromium through chromedp, against real Postgres and
// Redis, as a person would use it. It is a module of its own so that chromedp
// is no requirement of the library's module.
//
// Chromium comes from Debian (apt-get install chromium; scripts/test.sh
// installs it when missing). The screenshots the tests take are test
// artifacts, written under artifacts/ (git-ignored) or TEST_ARTIFACTS_DIR;
// `make console-screenshots` copies them into docs/images/.
package browsertest
