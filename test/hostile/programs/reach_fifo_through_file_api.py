# Makes a FIFO in the workspace, that the file API's read and write would have
# waited on forever (one agent thread and descriptor each): refused at once.
# status: succeeded
# api-read: /trap
import os
os.mkfifo("trap")
