"""The Streamlit dashboard (``kvgate dashboard``): app.py, screens/ (one per page), charts,
panels and formatting; it reads through gateway.db only."""
