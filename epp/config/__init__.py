"""EndpointPickerConfig: the reader, the field reader and `epp validate`."""
