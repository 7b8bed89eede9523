"""Prompts written for the mixed held-out set (`fasteagle.bench.heldout`): writing requests, short
questions, and word problems in forms the training templates do not use."""

WRITING = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle addressed to her.",
    "Write a cover letter for a junior data analyst position at a public library.",
    "Write a four-stanza poem about the first snow of winter in a small mountain town.",
    "Draft a polite email to my landlord asking to repair a leaking kitchen faucet.",
    "Write a product description for a reusable bamboo water bottle.",
    "Write a wedding toast for my older brother, who loves sailing and bad puns.",
    "Write a blog post introduction about learning to cook after turning forty.",
    "Compose a short speech for a high school graduation on the theme of curiosity.",
    "Write a limerick about a cat who is afraid of cucumbers.",
    "Write the opening paragraph of a mystery novel set on a night train to Vienna.",
    "Write a thank-you note to a nurse who cared for my grandmother in hospital.",
    "Write a short fable that teaches patience, with a tortoise and a crow.",
    "Draft a press release announcing a community garden opening in the city center.",
    "Write a persuasive paragraph arguing that schools should start one hour later.",
    "Write a dialogue between a robot and a child who is learning to ride a bicycle.",
    "Write a haiku sequence of three poems about a rainy afternoon in a cafe.",
    "Write a LinkedIn post celebrating a team that shipped a hard project on time.",
    "Write an apology message to a customer whose package arrived two weeks late.",
    "Write a bedtime story about a dragon who cannot breathe fire, only bubbles.",
    "Write a short review of an imaginary science-fiction film about life on Europa.",
    "Write a motivational letter to myself to read on the first day of a new job.",
    "Describe a busy fish market at dawn, using all five senses.",
    "Write a job advertisement for a part-time barista at a bookshop cafe.",
    "Write a short monologue for a villain who believes he is saving the world.",
]

QA = [
    "What causes the seasons on Earth?",
    "Who painted the Mona Lisa?",
    "Why is the sky blue?",
    "What is the difference between a virus and a bacterium?",
    "How many bones are in the adult human body?",
    "What does DNA stand for?",
    "What is the capital city of Australia?",
    "How does a refrigerator keep food cold?",
    "What is inflation in economics?",
    "Why do leaves change color in autumn?",
    "What is the speed of light in a vacuum?",
    "Who wrote the novel Pride and Prejudice?",
    "What is photosynthesis?",
    "How do vaccines work?",
    "What is the largest planet in our solar system?",
    "What is the boiling point of water at sea level in Fahrenheit?",
    "What is the difference between weather and climate?",
    "Why do we have leap years?",
    "What is a black hole?",
    "Which ocean is the deepest?",
    "What language has the most native speakers?",
    "How does a bill become a law in the United States?",
    "What is the function of the heart?",
    "What is the Pythagorean theorem?",
]

MATH = [
    "A recipe for 4 people needs 300 grams of rice. How many grams of rice are needed for 10 people?",
    "Lena is 3 times as old as her son. In 12 years she will be twice as old as him. How old is her son now?",
    "A jacket costs $80. It is on sale for 25% off, and then a 10% tax is added to the sale price. What "
    "is the final price?",
    "Two cyclists start 90 kilometers apart and ride toward each other at 12 and 18 kilometers per hour. "
    "After how many hours do they meet?",
    "A tank holds 500 liters. It is filled at 20 liters per minute while it leaks 5 liters per minute. "
    "How long does it take to fill the empty tank?",
    "Three friends split a restaurant bill of $127.50 equally and each adds a $4 tip. How much does each friend pay?",
    "A rectangular room is 6 meters by 4.5 meters. Carpet is priced at $22 per square meter. What will "
    "carpeting the room come to?",
    "If 5 workers can paint a house in 12 days, how many days would 8 workers take at the same rate?",
    "Priya scored 78, 85, 92 and 88 on four tests. What score does she need on the fifth test to average 87?",
    "A phone plan charges $15 per month plus $0.10 per text message. In March the bill was $27.40. How "
    "many texts were sent?",
    "A car uses 6.5 liters of fuel per 100 kilometers. How much fuel does it need for a 340 kilometer trip?",
    "A school orders 14 boxes of markers with 24 markers in each box. The markers are shared equally "
    "among 12 classrooms. How many markers does each classroom get?",
    "A farmer has chickens and cows. There are 30 heads and 84 legs in total. How many cows are there?",
    "You invest $2,000 at 5% interest compounded yearly. How much money do you have after 3 years?",
    "A movie starts at 7:45 pm and lasts 2 hours and 38 minutes. At what time does it end?",
    "A map uses a scale of 1 centimeter to 25 kilometers. Two towns are 7.2 centimeters apart on the "
    "map. How far apart are they really?",
    "Omar buys 3 notebooks at $2.75 each and 2 pens at $1.40 each. He pays with a $20 bill. How much "
    "change does he get?",
    "A swimming pool is 25 meters long. Kai swims 36 lengths. How many kilometers does he swim?",
    "The price of a stock rose by 20% on Monday and fell by 20% on Tuesday. It started at $50. What is "
    "its price after Tuesday?",
    "A bus leaves every 18 minutes and a tram every 24 minutes. Both leave the station at 8:00 am. When "
    "do they next leave together?",
    "A bag has 5 red, 7 blue and 8 green marbles. What is the probability of picking a blue marble at random?",
    "A cyclist rides 15 kilometers in 40 minutes. What is her average speed in kilometers per hour?",
    "A book club has 48 members. Three eighths of them prefer mysteries and one third of the rest prefer "
    "poetry. How many prefer poetry?",
    "A square garden has a perimeter of 36 meters. What is its area?",
]
