"""Every plugin type epp knows, by room; `epp.config.registry` joins them."""
