"""Colours, sizes and fonts the picture's panels share (one place, so the legend matches)."""

NETWORK = "#c0392b"  # messages between hosts
LOCAL = "#7f8c8d"  # messages inside a host
LOCAL_FILL = "#e5e8e8"
FRAME = "#34495e"
ROLE_FILL = {"both": "#d5f5e3", "src": "#fdebd0", "dst": "#d6eaf8", "idle": "#ffffff"}
ROLE_TEXT = {
    "both": "device in src and dst (keeps state)",
    "src": "device only in src (leaves)",
    "dst": "device only in dst (joins)",
    "idle": "device in neither",
}
SMALL, NORMAL, LARGE = 7, 8.5, 11  # font sizes, points
ROLE_WORD = {"both": "keep", "src": "leave", "dst": "join", "idle": "idle"}  # in a host's device count
