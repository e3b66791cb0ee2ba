"""The package version, on its own so that records can name it without importing the
package (and with it the whole compiler)."""
__version__ = "0.1.0"
