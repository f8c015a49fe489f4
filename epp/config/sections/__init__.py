"""The sections of an EndpointPickerConfig, one module each (see `epp/config/README.md`)."""
