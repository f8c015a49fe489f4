"""The live shell's eyes on the pool: the endpoint store (`store`), where
endpoints come from (`endpoints`), each engine's metric names (`engines`),
reading a metrics page (`reader`) and scraping it over HTTP (`scraper`)."""
