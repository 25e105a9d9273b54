"""The jobs role: outcome credit (`credit`) and dedup / decay / forget (`maintenance`)."""
