from ._records import Finding as Finding
from ._records import Frame as Frame
from ._records import OutputHit as OutputHit
from ._records import Report as Report
