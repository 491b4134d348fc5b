# A Unix socket in the workspace, to the file API.
# status: succeeded
# api-read: /sock
import socket
s = socket.socket(socket.AF_UNIX)
s.bind("sock")
s.listen()
held = s
